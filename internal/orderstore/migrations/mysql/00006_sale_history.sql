-- sale_history, as PostgreSQL's 00013: one row per sale, keyed by the SKU
-- and the sale's start (INSERT IGNORE lets every instance try; one row is
-- written). inventory.tag groups similar sales for the forecast, copied
-- into each row. refusals is a JSON object {reason: count}. A new table only.
-- 00004 and 00005 are other changes'.

-- +goose Up
ALTER TABLE inventory ADD COLUMN tag VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '';

CREATE TABLE sale_history (
    sku_id        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tag           VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    starts_at     DATETIME(6) NOT NULL,
    ends_at       DATETIME(6) NOT NULL,
    recorded_at   DATETIME(6) NOT NULL,
    stock         BIGINT      NOT NULL,
    seconds       BIGINT      NOT NULL,
    attempts      BIGINT      NOT NULL,
    accepted      BIGINT      NOT NULL,
    peak_attempts BIGINT      NOT NULL,
    peak_accepted BIGINT      NOT NULL,
    sell_out_ms   BIGINT      NULL,
    buyers        BIGINT      NOT NULL,
    units_sold    BIGINT      NOT NULL,
    refusals      TEXT        NOT NULL,
    p99_ms        DOUBLE      NULL,
    backlog_max   BIGINT      NOT NULL,
    queue_peak    BIGINT      NULL,
    queue_joins   BIGINT      NULL,
    bot_refusals  BIGINT      NULL,
    PRIMARY KEY (sku_id, starts_at),
    KEY sale_history_starts_idx (starts_at),
    KEY sale_history_tag_idx (tag, starts_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE sale_history;
ALTER TABLE inventory DROP COLUMN tag;
