-- Schema of record. Table and column names are a contract: operators' scripts
-- read them. Change them only with a new numbered migration.

-- +goose Up

-- inventory holds one row per flash-sale SKU. stock is the database stock
-- (units not held by a live order); total_stock is the allocation of the sale.
-- Conservation: stock + quantity of live orders = total_stock.
CREATE TABLE inventory (
    sku_id         text        PRIMARY KEY,
    stock          bigint      NOT NULL CHECK (stock >= 0),
    total_stock    bigint      NOT NULL CHECK (total_stock >= 0),
    per_user_limit bigint      NOT NULL CHECK (per_user_limit >= 1),
    starts_at      timestamptz NULL,
    ends_at        timestamptz NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- orders holds one row per applied reservation, failed ones included. No
-- foreign key to inventory: a reservation for a vanished SKU still ends as a
-- failed order row. created_at is when the gate accepted the reservation;
-- applied_at when the database applied it.
CREATE TABLE orders (
    order_id        text        PRIMARY KEY,
    sku_id          text        NOT NULL,
    user_id         text        NOT NULL,
    quantity        bigint      NOT NULL CHECK (quantity > 0),
    status          text        NOT NULL CHECK (status IN ('pending_payment', 'paid', 'cancelled', 'failed')),
    fail_reason     text        NULL,
    idempotency_key text        NULL,
    created_at      timestamptz NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_sku_user_idx ON orders (sku_id, user_id);
CREATE INDEX orders_sku_status_idx ON orders (sku_id, status);

-- process_log is the idempotency log: one row per reservation (tx_id = order
-- id) ever applied, written in the same transaction as its order row.
CREATE TABLE process_log (
    tx_id        text        PRIMARY KEY,
    sku_id       text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE process_log;
DROP TABLE orders;
DROP TABLE inventory;
