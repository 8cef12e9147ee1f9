-- A `state_changed` entry (a business resource changed state with no
-- operation behind it: a request with no key) names the resource and its new
-- state. NULL in every other entry, and then left out of the entry's hash, so
-- the chain made before these columns verifies as it did.
ALTER TABLE audit_journal ADD COLUMN resource_type TEXT;
ALTER TABLE audit_journal ADD COLUMN resource_id TEXT;
ALTER TABLE audit_journal ADD COLUMN state TEXT;
-- the inbox carries them to the chain
ALTER TABLE audit_inbox ADD COLUMN resource_type TEXT;
ALTER TABLE audit_inbox ADD COLUMN resource_id TEXT;
ALTER TABLE audit_inbox ADD COLUMN state TEXT;
