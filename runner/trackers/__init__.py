"""The driver's side of the trackers (the ``logger`` group): checked before launch, one run opened per job, its ids
recorded in run.json, closed with the job's status. Rank 0 logs into them (tasks/engine/trackers/)."""
