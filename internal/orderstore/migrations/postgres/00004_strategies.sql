-- Columns of the comparison purchase strategies (flashsale bench; see
-- docs/performance.md). The default pipeline does not read them.
--
-- version: a compare-and-set counter for db-optimistic (BuyOptimistic). The
-- trigger bumps it on every update of the row, whoever makes it (ApplyBatch,
-- BuyDirect, PutSKU, releases), so an optimistic writer that read the row
-- and a user's holdings before any such change finds its version stale.
--
-- fence: the highest lock token of redis-lock (BuyFenced) that changed the
-- row; a writer with a token not above it holds a lock that has since been
-- given to someone else, and is refused.

-- +goose Up
ALTER TABLE inventory
    ADD COLUMN version bigint NOT NULL DEFAULT 0,
    ADD COLUMN fence   bigint NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE FUNCTION inventory_bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER inventory_version BEFORE UPDATE ON inventory
    FOR EACH ROW EXECUTE FUNCTION inventory_bump_version();

-- +goose Down
DROP TRIGGER inventory_version ON inventory;
DROP FUNCTION inventory_bump_version();
ALTER TABLE inventory DROP COLUMN fence, DROP COLUMN version;
