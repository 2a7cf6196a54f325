-- A sale's tag (inventory.tag, '' for none) groups similar sales for
-- flashsale plan -forecast -tag; it is copied into each sale_history row,
-- so a later change of the SKU's tag leaves its past sales where they were.
-- Added with a default that changes nothing for the previous release.
--
-- sale_history: one row per sale that ended (or recorded on demand from the
-- admin API), keyed by the SKU and the sale's start, so that every instance
-- may try to record the same sale and exactly one row is written
-- (internal/salehistory, docs/capacity.md). refusals is a JSON object
-- {reason: count}. A new table only: the previous release runs beside it
-- untouched. 00011 and 00012 are other changes'.

-- +goose Up
ALTER TABLE inventory ADD COLUMN tag text NOT NULL DEFAULT ''
    CONSTRAINT inventory_tag_length CHECK (length(tag) <= 64);

CREATE TABLE sale_history (
    sku_id        text             NOT NULL,
    tag           text             NOT NULL DEFAULT '',
    starts_at     timestamptz      NOT NULL,
    ends_at       timestamptz      NOT NULL,
    recorded_at   timestamptz      NOT NULL,
    stock         bigint           NOT NULL,
    seconds       bigint           NOT NULL,
    attempts      bigint           NOT NULL,
    accepted      bigint           NOT NULL,
    peak_attempts bigint           NOT NULL,
    peak_accepted bigint           NOT NULL,
    sell_out_ms   bigint           NULL,
    buyers        bigint           NOT NULL,
    units_sold    bigint           NOT NULL,
    refusals      text             NOT NULL,
    p99_ms        double precision NULL,
    backlog_max   bigint           NOT NULL,
    queue_peak    bigint           NULL,
    queue_joins   bigint           NULL,
    bot_refusals  bigint           NULL,
    PRIMARY KEY (sku_id, starts_at)
);
CREATE INDEX sale_history_starts_idx ON sale_history (starts_at);
CREATE INDEX sale_history_tag_idx ON sale_history (tag, starts_at);

-- +goose Down
DROP TABLE sale_history;
ALTER TABLE inventory DROP COLUMN tag;
