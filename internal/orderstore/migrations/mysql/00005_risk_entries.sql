-- The risk lists, as PostgreSQL's 00012 (docs/risk.md): blocked buyers and
-- IP ranges, the audit of every add and removal, and the change counter
-- every instance polls. New tables only. 00004 is another change's.
-- Values are ascii (a user id or a canonical address or prefix), compared
-- byte for byte; a reason is utf8mb4 text of at most 200 characters.

-- +goose Up
CREATE TABLE risk_entries (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    kind       VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (kind IN ('buyer', 'ip')),
    value      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (length(value) >= 1),
    reason     VARCHAR(200) NOT NULL CHECK (char_length(reason) >= 1),
    source     VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (source IN ('admin', 'auto')),
    actor      VARCHAR(255) NOT NULL,
    created_at DATETIME(6)  NOT NULL,
    expires_at DATETIME(6)  NULL,
    deleted_at DATETIME(6)  NULL,
    deleted_by VARCHAR(255) NULL,
    KEY risk_entries_live_idx (deleted_at, kind, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE risk_audit (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    entry_id   BIGINT       NOT NULL,
    action     VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL CHECK (action IN ('add', 'remove')),
    kind       VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    value      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    reason     VARCHAR(200) NOT NULL,
    source     VARCHAR(8)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    expires_at DATETIME(6)  NULL,
    actor      VARCHAR(255) NOT NULL,
    source_ip  VARCHAR(64)  NULL,
    at         DATETIME(6)  NOT NULL,
    KEY risk_audit_entry_idx (entry_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE risk_version (
    one     SMALLINT NOT NULL PRIMARY KEY CHECK (one = 1),
    version BIGINT   NOT NULL
) ENGINE=InnoDB;
INSERT INTO risk_version (one, version) VALUES (1, 0);

-- +goose Down
DROP TABLE risk_version;
DROP TABLE risk_audit;
DROP TABLE risk_entries;
