package orderstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/flashsale/internal/sale"
)

// Adding an entry is one statement: the entry, its audit row and the step
// of the change counter commit together.
const addRiskSQL = `
WITH e AS (
    INSERT INTO risk_entries (kind, value, reason, source, actor, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id
), a AS (
    INSERT INTO risk_audit (entry_id, action, kind, value, reason, source, expires_at, actor, source_ip, at)
    SELECT id, 'add', $1, $2, $3, $4, $7, $5, $8, $6 FROM e
), v AS (
    UPDATE risk_version SET version = version + 1 WHERE one = 1
)
SELECT id FROM e`

// AddRisk lists c at now (canonical value, the actor of ctx) and returns the
// entry. The entry, its audit row (action add) and the step of the change
// counter (RiskVersion) commit together. Input that breaks the rules of
// RiskChange is an error wrapping sale.ErrInvalid, and nothing is written.
// Listing the same value twice makes two entries (removed one by one).
func (s *pgStore) AddRisk(ctx context.Context, c RiskChange, now time.Time) (RiskEntry, error) {
	now = dbTime(now)
	c, err := c.check(now)
	if err != nil {
		return RiskEntry{}, err
	}
	a := actorOf(ctx)
	e := RiskEntry{Kind: c.Kind, Value: c.Value, Reason: c.Reason, Source: c.Source, Actor: a.Name, CreatedAt: now, ExpiresAt: c.ExpiresAt}
	if err := s.pool.QueryRow(ctx, addRiskSQL, e.Kind, e.Value, e.Reason, e.Source, e.Actor, now, nullTime(e.ExpiresAt), nullString(a.SourceIP)).Scan(&e.ID); err != nil {
		return RiskEntry{}, fmt.Errorf("orderstore: add risk entry: %w", err)
	}
	return e, nil
}

const removeRiskSQL = `
WITH e AS (
    UPDATE risk_entries SET deleted_at = $2, deleted_by = $3
    WHERE id = $1 AND deleted_at IS NULL
    RETURNING id, kind, value, reason, source, actor, created_at, expires_at
), a AS (
    INSERT INTO risk_audit (entry_id, action, kind, value, reason, source, expires_at, actor, source_ip, at)
    SELECT id, 'remove', kind, value, reason, source, expires_at, $3, $4, $2 FROM e
), v AS (
    UPDATE risk_version SET version = version + 1 WHERE one = 1 AND EXISTS (SELECT 1 FROM e)
)
SELECT id, kind, value, reason, source, actor, created_at, expires_at FROM e`

// RemoveRisk takes entry id off the lists at now (the row stays, marked
// removed) and returns it as it was. The removal, its audit row (action
// remove, the actor of ctx) and the step of the change counter commit
// together. An id that names no entry, or one already removed, is
// sale.ErrUnknownRiskEntry. An expired entry may be removed.
func (s *pgStore) RemoveRisk(ctx context.Context, id int64, now time.Time) (RiskEntry, error) {
	now = dbTime(now)
	a := actorOf(ctx)
	e, err := scanRiskEntry(s.pool.QueryRow(ctx, removeRiskSQL, id, now, a.Name, nullString(a.SourceIP)))
	if noRows(err) {
		return RiskEntry{}, fmt.Errorf("%w: %d", sale.ErrUnknownRiskEntry, id)
	}
	if err != nil {
		return RiskEntry{}, fmt.Errorf("orderstore: remove risk entry %d: %w", id, err)
	}
	return e, nil
}

const riskEntriesSQL = `
SELECT id, kind, value, reason, source, actor, created_at, expires_at FROM risk_entries
WHERE deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $1) AND ($2 = '' OR kind = $2)
ORDER BY id`

// RiskEntries returns the entries live at now (not removed, not expired),
// of kind (RiskBuyer, RiskIP, or "" for both), oldest first; an empty slice
// when there are none.
func (s *pgStore) RiskEntries(ctx context.Context, kind string, now time.Time) ([]RiskEntry, error) {
	if !validRiskKind(kind) {
		return nil, fmt.Errorf("%w: kind must be buyer or ip", sale.ErrInvalid)
	}
	rows, err := s.pool.Query(ctx, riskEntriesSQL, dbTime(now), kind)
	if err != nil {
		return nil, fmt.Errorf("orderstore: risk entries: %w", err)
	}
	defer rows.Close()
	out := []RiskEntry{}
	for rows.Next() {
		e, err := scanRiskEntry(rows)
		if err != nil {
			return nil, fmt.Errorf("orderstore: risk entries: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orderstore: risk entries: %w", err)
	}
	return out, nil
}

const riskVersionSQL = `SELECT version FROM risk_version WHERE one = 1`

// RiskVersion returns the change counter of the risk lists: it grows with
// every add and removal, in commit order (each change steps it under the
// counter row's lock), so a reader that saw version v and reads v again has
// missed no change. An expiry is no change.
func (s *pgStore) RiskVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := s.pool.QueryRow(ctx, riskVersionSQL).Scan(&v); err != nil {
		return 0, fmt.Errorf("orderstore: risk version: %w", err)
	}
	return v, nil
}

const riskAuditSQL = `
SELECT id, entry_id, action, kind, value, reason, source, expires_at, actor, coalesce(source_ip, ''), at
FROM risk_audit WHERE id > $1 ORDER BY id LIMIT $2`

// RiskAudit returns up to limit rows of the risk lists' audit trail with id
// above after, oldest first (an empty slice when there are none).
func (s *pgStore) RiskAudit(ctx context.Context, after int64, limit int) ([]RiskAuditEntry, error) {
	rows, err := s.pool.Query(ctx, riskAuditSQL, after, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: risk audit: %w", err)
	}
	out := []RiskAuditEntry{}
	var a RiskAuditEntry
	var exp *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&a.ID, &a.EntryID, &a.Action, &a.Kind, &a.Value, &a.Reason, &a.Source, &exp, &a.Actor, &a.SourceIP, &a.At}, func() error {
		a.ExpiresAt = utcOrZero(exp)
		a.At = a.At.UTC()
		out = append(out, a)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orderstore: risk audit: %w", err)
	}
	return out, nil
}

// scanRiskEntry reads the columns id, kind, value, reason, source, actor,
// created_at, expires_at (either dialect).
func scanRiskEntry(row scanner) (RiskEntry, error) {
	var e RiskEntry
	var exp *time.Time
	if err := row.Scan(&e.ID, &e.Kind, &e.Value, &e.Reason, &e.Source, &e.Actor, &e.CreatedAt, &exp); err != nil {
		return RiskEntry{}, err
	}
	e.CreatedAt = e.CreatedAt.UTC()
	e.ExpiresAt = utcOrZero(exp)
	return e, nil
}

// utcOrZero is *t in UTC, or the zero time for nil.
func utcOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
