-- The risk lists (docs/risk.md): blocked buyers and IP ranges, each with a
-- reason, who listed it and an optional expiry. A removal keeps the row
-- (deleted_at, deleted_by); every add and every removal is also a row of
-- risk_audit, written in the same transaction. risk_version counts the
-- changes: each instance polls it every second and reloads the lists when it
-- moved (one row, one index look-up). New tables only: the previous release
-- runs beside them untouched. 00011 is another change's.

-- +goose Up
CREATE TABLE risk_entries (
    id         bigserial   PRIMARY KEY,
    kind       text        NOT NULL CHECK (kind IN ('buyer', 'ip')),
    value      text        NOT NULL CHECK (length(value) BETWEEN 1 AND 128),
    reason     text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 200),
    source     text        NOT NULL CHECK (source IN ('admin', 'auto')),
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NULL,
    deleted_at timestamptz NULL,
    deleted_by text        NULL
);
CREATE INDEX risk_entries_live_idx ON risk_entries (kind, id) WHERE deleted_at IS NULL;

CREATE TABLE risk_audit (
    id         bigserial   PRIMARY KEY,
    entry_id   bigint      NOT NULL,
    action     text        NOT NULL CHECK (action IN ('add', 'remove')),
    kind       text        NOT NULL,
    value      text        NOT NULL,
    reason     text        NOT NULL,
    source     text        NOT NULL,
    expires_at timestamptz NULL,
    actor      text        NOT NULL,
    source_ip  text        NULL,
    at         timestamptz NOT NULL
);
CREATE INDEX risk_audit_entry_idx ON risk_audit (entry_id, id);

CREATE TABLE risk_version (
    one     smallint NOT NULL PRIMARY KEY CHECK (one = 1),
    version bigint   NOT NULL
);
INSERT INTO risk_version (one, version) VALUES (1, 0);

-- +goose Down
DROP TABLE risk_version;
DROP TABLE risk_audit;
DROP TABLE risk_entries;
