-- Stock changes made outside flashsale (an ERP restock, a manual correction)
-- flow into Redis. The audit trigger of 00005 already records each such
-- change in stock_audit (reason external_change): that table is the durable,
-- ordered change log (its id is the resume position). This migration adds a
-- NOTIFY so that listeners apply a change within moments instead of at their
-- next poll.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION inventory_audit_external() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d bigint;
    aid bigint;
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
        VALUES (NEW.sku_id, 'db', d, 'external_change', current_user)
        RETURNING id INTO aid;
        PERFORM pg_notify('flashsale_stock_changes', NEW.sku_id || ':' || aid);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE INDEX stock_audit_external_idx ON stock_audit (id) WHERE reason = 'external_change';

-- +goose Down
DROP INDEX stock_audit_external_idx;
