"""The stall meter, torch-free: the producers' stage times per process
(:mod:`~fastdata.meter.table`), the training loop's waits
(:mod:`~fastdata.meter.loop`), the advice drawn from them
(:mod:`~fastdata.meter.advice`) and their export (:mod:`~fastdata.meter.export`).
The torch layer sets it up on its loaders and reads it in ``fastdata.stats``."""
