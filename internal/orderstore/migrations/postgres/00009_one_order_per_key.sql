-- One order per (user, SKU, Idempotency-Key), whichever path made it: the
-- gate's reservations applied by ApplyBatch, the database fallback
-- (BuyDirect), a reservation re-seeded by a rebuild. The unique index is the
-- final arbiter: a second reservation with a key that already made an order
-- is recorded failed (fail_reason 'duplicate_key') without the key, and its
-- units go back to the gate.
--
-- Orders without a key (NULL) never collide. Rows doubled before this
-- migration keep the key on one order per (user, SKU, key) (a live one
-- first, then the oldest); the others lose it, so the index can be built.
--
-- redis_restores.idempotency_key: the key of a direct sale's debit
-- ('sale-<order id>'), so that the gate learns which order the key made.

-- +goose Up
UPDATE orders o SET idempotency_key = NULL
FROM (
    SELECT order_id, row_number() OVER (
        PARTITION BY sku_id, user_id, idempotency_key
        ORDER BY (status IN ('pending_payment', 'paid')) DESC, created_at, order_id) AS n
    FROM orders WHERE idempotency_key IS NOT NULL
) d
WHERE o.order_id = d.order_id AND d.n > 1;

DROP INDEX orders_idempotency_idx;
CREATE UNIQUE INDEX orders_idempotency_idx ON orders (sku_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

ALTER TABLE redis_restores ADD COLUMN idempotency_key text NULL;

-- +goose Down
ALTER TABLE redis_restores DROP COLUMN idempotency_key;
DROP INDEX orders_idempotency_idx;
CREATE INDEX orders_idempotency_idx ON orders (sku_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
