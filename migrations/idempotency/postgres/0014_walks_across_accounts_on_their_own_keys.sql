-- Two keys lead with the order a walk across accounts reads, and name the
-- account second (docs/design.md §13). Led by account_id, each table needed a
-- second B-tree on the same ids for that walk: one more index entry for every
-- claim and for each of its journal records. A partition (and a Citus shard)
-- enforces a key that includes the distribution column wherever the column
-- stands, and a lookup that names both columns probes it the same either way.
--
--   operations (operation_id, account_id): an account's operation by id, the
--     outbox's and approvals' foreign keys, and the retention reaper's walk
--     by age (operation ids are UUIDv7) across every account.
--   audit_inbox (id, account_id): the chainer's order across every account,
--     and the deletion of what it took.

ALTER TABLE idempotency_approvals DROP CONSTRAINT idempotency_approvals_operation_id_fkey;
ALTER TABLE idempotency_outbox DROP CONSTRAINT idempotency_outbox_operation_id_fkey;
ALTER TABLE idempotency_operations DROP CONSTRAINT idempotency_operations_operation_id_key;
DROP INDEX idempotency_operations_by_age;
ALTER TABLE idempotency_operations ADD CONSTRAINT idempotency_operations_operation_id_key
    UNIQUE (operation_id, account_id);
ALTER TABLE idempotency_approvals ADD CONSTRAINT idempotency_approvals_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES idempotency_operations (account_id, operation_id)
    ON DELETE CASCADE;
ALTER TABLE idempotency_outbox ADD CONSTRAINT idempotency_outbox_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES idempotency_operations (account_id, operation_id)
    ON DELETE CASCADE;

DROP INDEX audit_inbox_in_order;
ALTER TABLE audit_inbox DROP CONSTRAINT audit_inbox_pkey;
ALTER TABLE audit_inbox ADD PRIMARY KEY (id, account_id);
