-- A VACUUM of the inbox (the journal's own, every few thousand records, and
-- autovacuum's) leaves the table at its size instead of giving its empty tail
-- back to the file system (issue 7). Giving it back takes an ACCESS EXCLUSIVE
-- lock on the table, which every create's claim then waits for: in the bench,
-- the journal's vacuums of 5,000 dead rows took 350 ms each, most of it
-- trying for that lock between the creates. Inserts reuse the freed space, so
-- the table stays as large as its longest backlog.
ALTER TABLE audit_inbox SET (vacuum_truncate = false);
