-- The database checks each journal entry's link itself: an entry is refused
-- unless its prev_hash is the hash of the entry before it (seq - 1), or the
-- genesis hash for the first. With seq as the primary key, every entry then
-- has at most one successor (no fork) and no entry is missing before it (no
-- gap), whoever writes. It replaces UNIQUE (prev_hash), which refused a fork
-- only, and cost every entry an insert into an index of random hashes
-- (issue 7). The check reads the page the append writes anyway.
--
-- A row trigger sees the rows its statement inserted before it, so a batch
-- of entries in one INSERT is checked link by link.
ALTER TABLE audit_journal DROP CONSTRAINT audit_journal_prev_hash_key;

CREATE FUNCTION audit_journal_links_onto_the_entry_before() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.prev_hash IS DISTINCT FROM coalesce(
        (SELECT hash FROM audit_journal WHERE seq = NEW.seq - 1),
        CASE WHEN NEW.seq = 1 THEN '0000000000000000000000000000000000000000000000000000000000000000' END)
    THEN
        RAISE EXCEPTION 'audit_journal: an entry must link onto the entry before it (seq %)', NEW.seq
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER audit_journal_links_onto_the_entry_before BEFORE INSERT ON audit_journal
    FOR EACH ROW EXECUTE FUNCTION audit_journal_links_onto_the_entry_before();
