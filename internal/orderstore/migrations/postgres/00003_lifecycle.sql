-- The order lifecycle: payment, cancellation and the payment timeout.
-- Names are a contract like those of 00001.

-- +goose Up

-- expires_at: when an unpaid order is released (created_at + payment timeout);
-- NULL for failed orders. paid_at / cancelled_at / cancel_reason record the
-- terminal transition; payment_ref is the payment provider's reference.
ALTER TABLE orders
    ADD COLUMN expires_at    timestamptz NULL,
    ADD COLUMN paid_at       timestamptz NULL,
    ADD COLUMN cancelled_at  timestamptz NULL,
    ADD COLUMN cancel_reason text        NULL,
    ADD COLUMN payment_ref   text        NULL;

-- The release sweeper claims due orders in deadline order.
CREATE INDEX orders_expiry_idx ON orders (expires_at) WHERE status = 'pending_payment';

-- order_transitions records every status change of every order with its
-- time and cause, written in the transaction that makes the change. It is
-- also the outbox of order events: published_at is set once the event is
-- in the stream.
CREATE TABLE order_transitions (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    sku_id       text        NOT NULL,
    user_id      text        NOT NULL,
    quantity     bigint      NOT NULL,
    from_status  text        NULL,
    to_status    text        NOT NULL,
    cause        text        NOT NULL,
    at           timestamptz NOT NULL,
    published_at timestamptz NULL
);
CREATE INDEX order_transitions_order_idx ON order_transitions (order_id);
CREATE INDEX order_transitions_unpublished_idx ON order_transitions (id) WHERE published_at IS NULL;

-- redis_restores is the Redis work a release owes: give the units and the
-- buyer's slot back in the gate. Written in the release's transaction and
-- deleted once done (the gate applies each order id once).
CREATE TABLE redis_restores (
    order_id   text        PRIMARY KEY,
    sku_id     text        NOT NULL,
    user_id    text        NOT NULL,
    quantity   bigint      NOT NULL CHECK (quantity > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX redis_restores_sku_idx ON redis_restores (sku_id);

-- cancel_requests are cancellations of orders still queued (accepted by the
-- gate, not yet applied): the order is recorded cancelled when it lands.
CREATE TABLE cancel_requests (
    order_id     text        PRIMARY KEY,
    user_id      text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE cancel_requests;
DROP TABLE redis_restores;
DROP TABLE order_transitions;
DROP INDEX orders_expiry_idx;
ALTER TABLE orders DROP COLUMN payment_ref, DROP COLUMN cancel_reason, DROP COLUMN cancelled_at,
    DROP COLUMN paid_at, DROP COLUMN expires_at;
