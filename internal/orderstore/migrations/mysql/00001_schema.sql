-- The schema of record on MySQL 8 / MariaDB 10.6+: the same tables, columns
-- and meaning as the PostgreSQL migrations 00001-00008 (names are a
-- contract), in one migration because this dialect started after them.
-- Differences, all forced by the dialect:
-- - ids are VARCHAR in the ascii_bin collation (case-sensitive, compared
--   byte for byte like PostgreSQL text); free text is utf8mb4.
-- - times are DATETIME(6) holding UTC (the driver runs with loc=UTC and the
--   session with time_zone '+00:00').
-- - no partial indexes: the release sweeper's index is (status, expires_at),
--   the outbox's (published_at, id).
-- - the audit trigger tells flashsale's own sessions by the session variable
--   @flashsale_audited (set by the store on every connection it opens)
--   instead of a transaction-local setting.

-- +goose Up
CREATE TABLE inventory (
    sku_id         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    stock          BIGINT      NOT NULL CHECK (stock >= 0),
    total_stock    BIGINT      NOT NULL CHECK (total_stock >= 0),
    per_user_limit BIGINT      NOT NULL CHECK (per_user_limit >= 1),
    starts_at      DATETIME(6) NULL,
    ends_at        DATETIME(6) NULL,
    created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    version        BIGINT      NOT NULL DEFAULT 0,
    fence          BIGINT      NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE orders (
    order_id        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku_id          VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity        BIGINT       NOT NULL CHECK (quantity > 0),
    status          VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                    CHECK (status IN ('pending_payment', 'paid', 'cancelled', 'failed')),
    fail_reason     VARCHAR(64)  NULL,
    idempotency_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    created_at      DATETIME(6)  NOT NULL,
    applied_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    expires_at      DATETIME(6)  NULL,
    paid_at         DATETIME(6)  NULL,
    cancelled_at    DATETIME(6)  NULL,
    cancel_reason   VARCHAR(255) NULL,
    payment_ref     VARCHAR(255) NULL,
    KEY orders_sku_user_idx (sku_id, user_id),
    KEY orders_sku_status_idx (sku_id, status),
    KEY orders_idempotency_idx (sku_id, user_id, idempotency_key),
    KEY orders_expiry_idx (status, expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE process_log (
    tx_id        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku_id       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    processed_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE order_transitions (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sku_id       VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity     BIGINT       NOT NULL,
    from_status  VARCHAR(16)  NULL,
    to_status    VARCHAR(16)  NOT NULL,
    cause        VARCHAR(255) NOT NULL,
    at           DATETIME(6)  NOT NULL,
    published_at DATETIME(6)  NULL,
    KEY order_transitions_order_idx (order_id),
    KEY order_transitions_unpublished_idx (published_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Redis work the database owes: a release's units and buyer slot back
-- (quantity > 0), a direct sale's units taken (quantity < 0, order_id
-- 'sale-<order id>'), or a stock
-- change made outside flashsale (order_id 'ext-<stock_audit id>-<uuid>', user_id '').
CREATE TABLE redis_restores (
    order_id   VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    sku_id     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity   BIGINT       NOT NULL CHECK (quantity <> 0),
    created_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY redis_restores_sku_idx (sku_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE cancel_requests (
    order_id     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    user_id      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    requested_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE stock_audit (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    sku_id     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    store      VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (store IN ('db', 'redis')),
    delta      BIGINT       NOT NULL,
    reason     VARCHAR(255) NOT NULL,
    order_id   VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    actor      VARCHAR(255) NOT NULL,
    source_ip  VARCHAR(64)  NULL,
    created_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    KEY stock_audit_sku_idx (sku_id, id),
    KEY stock_audit_reason_idx (reason, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- version counts updates (the optimistic strategy's CAS). The sale's
-- allocation (total_stock) follows an external change of stock that does
-- not set total_stock itself: an ERP restock of 50 is 50 more units for the
-- sale, and stock + live units = total_stock holds.
-- +goose StatementBegin
CREATE TRIGGER inventory_version BEFORE UPDATE ON inventory FOR EACH ROW
BEGIN
    SET NEW.version = OLD.version + 1;
    IF coalesce(@flashsale_audited, 0) <> 1 AND NEW.total_stock = OLD.total_stock THEN
        SET NEW.total_stock = OLD.total_stock + (NEW.stock - OLD.stock);
    END IF;
END
-- +goose StatementEnd

-- Changes of stock made by anything but flashsale (an ERP restock, a manual
-- correction) are recorded in stock_audit (reason external_change) and owed
-- to Redis as a redis_restores row, in the changing transaction: the
-- restorer applies each to the gate exactly once (change data capture
-- through the database itself; see docs/architecture.md). The token is
-- 'ext-<audit id>-<uuid>': unique even if stock_audit is truncated and
-- AUTO_INCREMENT starts again. Times are written in UTC explicitly: the
-- other client's session may run in any time zone.
-- +goose StatementBegin
CREATE TRIGGER inventory_audit_insert AFTER INSERT ON inventory FOR EACH ROW
BEGIN
    IF coalesce(@flashsale_audited, 0) <> 1 AND NEW.stock <> 0 THEN
        INSERT INTO stock_audit (sku_id, store, delta, reason, actor, created_at)
        VALUES (NEW.sku_id, 'db', NEW.stock, 'external_change', current_user(), utc_timestamp(6));
        INSERT INTO redis_restores (order_id, sku_id, user_id, quantity, created_at)
        VALUES (concat('ext-', last_insert_id(), '-', uuid()), NEW.sku_id, '', NEW.stock, utc_timestamp(6));
    END IF;
END
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER inventory_audit_update AFTER UPDATE ON inventory FOR EACH ROW
BEGIN
    IF coalesce(@flashsale_audited, 0) <> 1 AND NEW.stock <> OLD.stock THEN
        INSERT INTO stock_audit (sku_id, store, delta, reason, actor, created_at)
        VALUES (NEW.sku_id, 'db', NEW.stock - OLD.stock, 'external_change', current_user(), utc_timestamp(6));
        INSERT INTO redis_restores (order_id, sku_id, user_id, quantity, created_at)
        VALUES (concat('ext-', last_insert_id(), '-', uuid()), NEW.sku_id, '', NEW.stock - OLD.stock, utc_timestamp(6));
    END IF;
END
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER inventory_audit_update;
DROP TRIGGER inventory_audit_insert;
DROP TRIGGER inventory_version;
DROP TABLE stock_audit;
DROP TABLE cancel_requests;
DROP TABLE redis_restores;
DROP TABLE order_transitions;
DROP TABLE process_log;
DROP TABLE orders;
DROP TABLE inventory;
