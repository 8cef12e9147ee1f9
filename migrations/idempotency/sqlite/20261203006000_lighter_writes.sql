-- An index every idempotent write paid for that nothing needs (issue 7: the
-- cost of an idempotent write is what it writes). The reaper no longer needs
-- an index of its own: operation ids are UUIDv7, which sort by creation time,
-- and an operation finishes after it is created, so every operation finished
-- before the reaper's cutoff has an id below the cutoff's first id. The
-- reaper walks the operation_id index up to there (idempotency::store::reap).
DROP INDEX idempotency_operations_finished_by_age;
