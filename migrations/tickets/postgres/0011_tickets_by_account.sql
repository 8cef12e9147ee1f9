-- The shape a distributed PostgreSQL shards (docs/design.md §13): every key of
-- the tickets' tables begins with account_id, and a comment's ticket is found
-- within its account, so both tables can live on the node of their account.
-- Upgrades in place: only keys change, every row stays.

ALTER TABLE ticket_comments DROP CONSTRAINT ticket_comments_ticket_id_fkey;

ALTER TABLE tickets DROP CONSTRAINT tickets_pkey;
ALTER TABLE tickets ADD PRIMARY KEY (account_id, seq);
ALTER TABLE tickets DROP CONSTRAINT tickets_id_key;
ALTER TABLE tickets ADD CONSTRAINT tickets_id_key UNIQUE (account_id, id);

ALTER TABLE ticket_comments DROP CONSTRAINT ticket_comments_pkey;
ALTER TABLE ticket_comments ADD PRIMARY KEY (account_id, seq);
ALTER TABLE ticket_comments DROP CONSTRAINT ticket_comments_id_key;
ALTER TABLE ticket_comments ADD CONSTRAINT ticket_comments_id_key UNIQUE (account_id, id);
ALTER TABLE ticket_comments ADD CONSTRAINT ticket_comments_ticket_id_fkey
    FOREIGN KEY (account_id, ticket_id) REFERENCES tickets (account_id, id);
DROP INDEX ticket_comments_by_ticket;
CREATE INDEX ticket_comments_by_ticket ON ticket_comments (account_id, ticket_id, list_seq);
