"""What beat and the operator run: passes and their parts, autotune, requeue, secrets rotation, beat leadership."""
