-- A sale made by the database fallback (Redis circuit breaker open) is owed
-- to Redis as well: a redis_restores row with a negative quantity takes the
-- units and the buyer's slot in the gate once Redis is back, exactly once,
-- like a release gives them back. So Redis learns of every direct sale, from
-- any instance, even one committed after a rebuild's snapshot.

-- +goose Up
ALTER TABLE redis_restores DROP CONSTRAINT redis_restores_quantity_check;
ALTER TABLE redis_restores ADD CONSTRAINT redis_restores_quantity_check CHECK (quantity <> 0);

-- +goose Down
DELETE FROM redis_restores WHERE quantity < 0;
ALTER TABLE redis_restores DROP CONSTRAINT redis_restores_quantity_check;
ALTER TABLE redis_restores ADD CONSTRAINT redis_restores_quantity_check CHECK (quantity > 0);
