-- The journal's link check looks up each appended entry's predecessor by its
-- primary key (issue 7). Written as a join, its plan was the planner's choice:
-- a profile of the bench's creates caught it hashing the whole journal to
-- check each round (about 3% of PostgreSQL's time), while the statistics
-- lagged behind a young, fast-growing journal; a round's cost then grew with
-- the journal until the next ANALYZE. As a subquery on `seq`, the check is
-- one index probe per appended entry, whatever the statistics say.
-- What it refuses is unchanged: an entry that does not link onto the entry
-- before it (seq - 1), or is not the first with the genesis hash.
CREATE OR REPLACE FUNCTION audit_journal_entries_link_onto_the_entry_before() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    broken BIGINT;
BEGIN
    SELECT appended.seq INTO broken
    FROM appended
    WHERE appended.prev_hash IS DISTINCT FROM coalesce(
        (SELECT before.hash FROM audit_journal before WHERE before.seq = appended.seq - 1),
        CASE WHEN appended.seq = 1 THEN '0000000000000000000000000000000000000000000000000000000000000000' END)
    ORDER BY appended.seq
    LIMIT 1;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'audit_journal: an entry must link onto the entry before it (seq %)', broken
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END;
$$;
