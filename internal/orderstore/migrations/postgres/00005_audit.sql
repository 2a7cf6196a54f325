-- stock_audit: every change of a SKU's stock, who made it, when, from where
-- and why. store 'db' rows are written in the transaction that changes
-- inventory.stock, so per SKU the sum of 'db' deltas equals inventory.stock.
-- store 'redis' rows record corrections and re-seeds of the gate.

-- +goose Up
CREATE TABLE stock_audit (
    id         bigserial   PRIMARY KEY,
    sku_id     text        NOT NULL,
    store      text        NOT NULL CHECK (store IN ('db', 'redis')),
    delta      bigint      NOT NULL,
    reason     text        NOT NULL,
    order_id   text        NULL,
    actor      text        NOT NULL,
    source_ip  text        NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stock_audit_sku_idx ON stock_audit (sku_id, id);

-- Stock that exists before this migration is its own baseline.
INSERT INTO stock_audit (sku_id, store, delta, reason, actor)
SELECT sku_id, 'db', stock, 'baseline', 'migration' FROM inventory WHERE stock <> 0;

-- flashsale writes its audit rows itself (with the order, the user and the
-- source IP) and marks its transactions with flashsale.audited = on. A change
-- made by anything else (an ERP restock, a manual correction) is recorded by
-- this trigger, so the audit trail stays complete either way.
-- +goose StatementBegin
CREATE FUNCTION inventory_audit_external() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d bigint;
BEGIN
    IF coalesce(current_setting('flashsale.audited', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        d := NEW.stock;
    ELSE
        d := NEW.stock - OLD.stock;
    END IF;
    IF d <> 0 THEN
        INSERT INTO stock_audit (sku_id, store, delta, reason, actor)
        VALUES (NEW.sku_id, 'db', d, 'external_change', current_user);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER inventory_audit AFTER INSERT OR UPDATE OF stock ON inventory
    FOR EACH ROW EXECUTE FUNCTION inventory_audit_external();

-- +goose Down
DROP TRIGGER inventory_audit ON inventory;
DROP FUNCTION inventory_audit_external();
DROP TABLE stock_audit;
