package orderstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/flashsale/flashsale/internal/sale"
)

const (
	myAddRiskSQL         = `INSERT INTO risk_entries (kind, value, reason, source, actor, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`
	myRiskAuditInsertSQL = `INSERT INTO risk_audit (entry_id, action, kind, value, reason, source, expires_at, actor, source_ip, at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	myBumpRiskSQL    = `UPDATE risk_version SET version = version + 1 WHERE one = 1`
	myLockRiskSQL    = `SELECT id, kind, value, reason, source, actor, created_at, expires_at FROM risk_entries WHERE id = ? AND deleted_at IS NULL FOR UPDATE`
	myRemoveRiskSQL  = `UPDATE risk_entries SET deleted_at = ?, deleted_by = ? WHERE id = ?`
	myRiskEntriesSQL = `
SELECT id, kind, value, reason, source, actor, created_at, expires_at FROM risk_entries
WHERE deleted_at IS NULL AND (expires_at IS NULL OR expires_at > ?) AND (? = '' OR kind = ?)
ORDER BY id`
	myRiskAuditSQL = `
SELECT id, entry_id, action, kind, value, reason, source, expires_at, actor, coalesce(source_ip, ''), at
FROM risk_audit WHERE id > ? ORDER BY id LIMIT ?`
)

// AddRisk is pgStore.AddRisk: the entry, its audit row and the step of
// the change counter in one transaction.
func (s *myStore) AddRisk(ctx context.Context, c RiskChange, now time.Time) (RiskEntry, error) {
	now = dbTime(now)
	c, err := c.check(now)
	if err != nil {
		return RiskEntry{}, err
	}
	a := actorOf(ctx)
	e := RiskEntry{Kind: c.Kind, Value: c.Value, Reason: c.Reason, Source: c.Source, Actor: a.Name, CreatedAt: now, ExpiresAt: c.ExpiresAt}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, myAddRiskSQL, e.Kind, e.Value, e.Reason, e.Source, e.Actor, now, nullTime(e.ExpiresAt))
		if err != nil {
			return err
		}
		if e.ID, err = res.LastInsertId(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, myRiskAuditInsertSQL, e.ID, "add", e.Kind, e.Value, e.Reason, e.Source, nullTime(e.ExpiresAt), a.Name, nullString(a.SourceIP), now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, myBumpRiskSQL)
		return err
	})
	if err != nil {
		return RiskEntry{}, fmt.Errorf("orderstore: add risk entry: %w", err)
	}
	return e, nil
}

// RemoveRisk is pgStore.RemoveRisk.
func (s *myStore) RemoveRisk(ctx context.Context, id int64, now time.Time) (RiskEntry, error) {
	now = dbTime(now)
	a := actorOf(ctx)
	var e RiskEntry
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		if e, err = myScanRiskEntry(tx.QueryRowContext(ctx, myLockRiskSQL, id)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, myRemoveRiskSQL, now, a.Name, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, myRiskAuditInsertSQL, e.ID, "remove", e.Kind, e.Value, e.Reason, e.Source, nullTime(e.ExpiresAt), a.Name, nullString(a.SourceIP), now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, myBumpRiskSQL)
		return err
	})
	if noRows(err) {
		return RiskEntry{}, fmt.Errorf("%w: %d", sale.ErrUnknownRiskEntry, id)
	}
	if err != nil {
		return RiskEntry{}, fmt.Errorf("orderstore: remove risk entry %d: %w", id, err)
	}
	return e, nil
}

// RiskEntries is pgStore.RiskEntries.
func (s *myStore) RiskEntries(ctx context.Context, kind string, now time.Time) ([]RiskEntry, error) {
	if !validRiskKind(kind) {
		return nil, fmt.Errorf("%w: kind must be buyer or ip", sale.ErrInvalid)
	}
	rows, err := s.db.QueryContext(ctx, myRiskEntriesSQL, dbTime(now), kind, kind)
	if err != nil {
		return nil, fmt.Errorf("orderstore: risk entries: %w", err)
	}
	defer rows.Close()
	out := []RiskEntry{}
	for rows.Next() {
		e, err := myScanRiskEntry(rows)
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

// RiskVersion is pgStore.RiskVersion.
func (s *myStore) RiskVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := s.db.QueryRowContext(ctx, riskVersionSQL).Scan(&v); err != nil {
		return 0, fmt.Errorf("orderstore: risk version: %w", err)
	}
	return v, nil
}

// RiskAudit is pgStore.RiskAudit.
func (s *myStore) RiskAudit(ctx context.Context, after int64, limit int) ([]RiskAuditEntry, error) {
	rows, err := s.db.QueryContext(ctx, myRiskAuditSQL, after, limit)
	if err != nil {
		return nil, fmt.Errorf("orderstore: risk audit: %w", err)
	}
	defer rows.Close()
	out := []RiskAuditEntry{}
	for rows.Next() {
		var a RiskAuditEntry
		var exp sql.NullTime
		if err := rows.Scan(&a.ID, &a.EntryID, &a.Action, &a.Kind, &a.Value, &a.Reason, &a.Source, &exp, &a.Actor, &a.SourceIP, &a.At); err != nil {
			return nil, fmt.Errorf("orderstore: risk audit: %w", err)
		}
		if exp.Valid {
			a.ExpiresAt = exp.Time.UTC()
		}
		a.At = a.At.UTC()
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("orderstore: risk audit: %w", err)
	}
	return out, nil
}

// myScanRiskEntry reads the columns of scanRiskEntry from a MySQL row.
func myScanRiskEntry(row scanner) (RiskEntry, error) {
	var e RiskEntry
	var exp sql.NullTime
	if err := row.Scan(&e.ID, &e.Kind, &e.Value, &e.Reason, &e.Source, &e.Actor, &e.CreatedAt, &exp); err != nil {
		return RiskEntry{}, err
	}
	e.CreatedAt = e.CreatedAt.UTC()
	if exp.Valid {
		e.ExpiresAt = exp.Time.UTC()
	}
	return e, nil
}
