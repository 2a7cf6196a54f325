-- The number of stock buckets the Redis gate splits a sale over (each
-- bucket under its own hash tag, so a hot SKU spreads over a Redis
-- Cluster's primaries). 1: not split.

-- +goose Up
ALTER TABLE inventory ADD COLUMN buckets integer NOT NULL DEFAULT 1
    CONSTRAINT inventory_buckets_range CHECK (buckets BETWEEN 1 AND 64);

-- +goose Down
ALTER TABLE inventory DROP COLUMN buckets;
