-- Change data capture: a stock change made outside flashsale (recorded by
-- the audit trigger as external_change) is also owed to Redis, as a
-- redis_restores row written in the changing transaction (order_id
-- 'ext-<stock_audit id>-<uuid>': unique even if stock_audit is truncated with
-- RESTART IDENTITY; user_id ''). The restorer applies each to the gate
-- exactly once (the gate's rel set is the token), woken by the NOTIFY; the
-- pending rows are the resume position, so a restart loses nothing.

-- +goose Up

-- The sale's allocation (total_stock) follows an external change of stock
-- when the change does not set total_stock itself: an ERP restock of 50 is
-- 50 more units for the sale, and stock + live units = total_stock holds.
-- +goose StatementBegin
CREATE FUNCTION inventory_external_allocation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('flashsale.audited', true), '') <> 'on'
       AND NEW.total_stock = OLD.total_stock THEN
        NEW.total_stock := OLD.total_stock + (NEW.stock - OLD.stock);
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER inventory_external_allocation BEFORE UPDATE OF stock ON inventory
    FOR EACH ROW EXECUTE FUNCTION inventory_external_allocation();
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
        INSERT INTO redis_restores (order_id, sku_id, user_id, quantity)
        VALUES ('ext-' || aid || '-' || gen_random_uuid(), NEW.sku_id, '', d);
        PERFORM pg_notify('flashsale_stock_changes', NEW.sku_id || ':' || aid);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER inventory_external_allocation ON inventory;
DROP FUNCTION inventory_external_allocation();
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
DELETE FROM redis_restores WHERE order_id LIKE 'ext-%';
-- Direct-sale debits are keyed 'sale-<order id>' from 00008 on.
