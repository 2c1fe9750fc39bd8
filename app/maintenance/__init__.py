"""What beat (and the operator) runs: retries, recovery, wipe repair,
reconcile, cleanup (passes), autotune, the beat leadership and fencing
(periodic), requeue, and the reports' contracts (schemas)."""
