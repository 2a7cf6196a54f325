-- The crowd settings of a sale (docs/crowd.md): a proof-of-work ticket
-- before buying (tickets issued from tickets_open_at, or the sale's start
-- when NULL), and a waiting room admitting buyers at admission_rate per
-- second (0: derived from the remaining stock and the gate's capacity).
-- Added with defaults that change nothing, so the previous release, which
-- neither reads nor writes them, runs beside this one.

-- +goose Up
ALTER TABLE inventory
    ADD COLUMN ticket_required boolean NOT NULL DEFAULT false,
    ADD COLUMN tickets_open_at timestamptz NULL,
    ADD COLUMN waiting_room boolean NOT NULL DEFAULT false,
    ADD COLUMN admission_rate integer NOT NULL DEFAULT 0
        CONSTRAINT inventory_admission_rate_range CHECK (admission_rate BETWEEN 0 AND 1000000);

-- +goose Down
ALTER TABLE inventory
    DROP COLUMN ticket_required,
    DROP COLUMN tickets_open_at,
    DROP COLUMN waiting_room,
    DROP COLUMN admission_rate;
