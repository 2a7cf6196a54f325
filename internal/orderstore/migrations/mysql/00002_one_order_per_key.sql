-- One order per (user, SKU, Idempotency-Key), as PostgreSQL's 00009: a
-- unique key replaces orders_idempotency_idx (NULLs never collide), after
-- the key is taken off all but one order of each doubled (user, SKU, key)
-- (a live one first, then the oldest). redis_restores.idempotency_key is the
-- key of a direct sale's debit.

-- +goose Up
UPDATE orders o JOIN (
    SELECT order_id, row_number() OVER (
        PARTITION BY sku_id, user_id, idempotency_key
        ORDER BY (status IN ('pending_payment', 'paid')) DESC, created_at, order_id) AS n
    FROM orders WHERE idempotency_key IS NOT NULL
) d ON o.order_id = d.order_id
SET o.idempotency_key = NULL
WHERE d.n > 1;

ALTER TABLE orders DROP KEY orders_idempotency_idx,
    ADD UNIQUE KEY orders_idempotency_idx (sku_id, user_id, idempotency_key);

ALTER TABLE redis_restores ADD COLUMN idempotency_key VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL;

-- +goose Down
ALTER TABLE redis_restores DROP COLUMN idempotency_key;
ALTER TABLE orders DROP KEY orders_idempotency_idx,
    ADD KEY orders_idempotency_idx (sku_id, user_id, idempotency_key);
