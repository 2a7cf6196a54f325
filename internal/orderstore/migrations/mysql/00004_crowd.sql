-- The crowd settings of a sale, as PostgreSQL's 00011 (docs/crowd.md).
-- Defaults that change nothing: the previous release runs beside this one.

-- +goose Up
ALTER TABLE inventory
    ADD COLUMN ticket_required BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN tickets_open_at DATETIME(6) NULL,
    ADD COLUMN waiting_room BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN admission_rate INT NOT NULL DEFAULT 0,
    ADD CONSTRAINT inventory_admission_rate_range CHECK (admission_rate BETWEEN 0 AND 1000000);

-- +goose Down
ALTER TABLE inventory
    DROP CONSTRAINT inventory_admission_rate_range,
    DROP COLUMN ticket_required,
    DROP COLUMN tickets_open_at,
    DROP COLUMN waiting_room,
    DROP COLUMN admission_rate;
