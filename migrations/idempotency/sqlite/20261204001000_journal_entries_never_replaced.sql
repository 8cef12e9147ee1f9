-- An entry is never replaced (CONTRACT §8). `INSERT OR REPLACE` (and
-- `REPLACE`, and any INSERT whose conflict clause says REPLACE) deletes the
-- entry it conflicts with without firing the delete trigger — SQLite fires
-- delete triggers for a REPLACE only with `recursive_triggers` on — and the
-- link check passes for a forged entry that links onto the one before it. So
-- the database refuses an insert at a `seq` that is taken, before any
-- conflict clause is applied. An upsert (`ON CONFLICT DO UPDATE`) is refused
-- here too; without this trigger, the update trigger would refuse it.
CREATE TRIGGER audit_journal_no_replace BEFORE INSERT ON audit_journal
WHEN EXISTS (SELECT 1 FROM audit_journal WHERE seq = NEW.seq)
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: an entry is never replaced');
END;
