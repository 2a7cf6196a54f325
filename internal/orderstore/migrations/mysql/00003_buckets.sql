-- The number of stock buckets the Redis gate splits a sale over, as
-- PostgreSQL's 00010. 1: not split.

-- +goose Up
ALTER TABLE inventory ADD COLUMN buckets INT NOT NULL DEFAULT 1,
    ADD CONSTRAINT inventory_buckets_range CHECK (buckets BETWEEN 1 AND 64);

-- +goose Down
ALTER TABLE inventory DROP CONSTRAINT inventory_buckets_range, DROP COLUMN buckets;
