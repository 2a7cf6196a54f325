-- orders_idempotency_idx serves BuyDirect's look-up of a user's earlier order
-- with the same Idempotency-Key. Not unique: ApplyBatch records whatever the
-- gate admitted. Partial: most orders carry no key.

-- +goose Up
CREATE INDEX orders_idempotency_idx ON orders (sku_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP INDEX orders_idempotency_idx;
