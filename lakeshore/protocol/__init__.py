"""The queue on the store: every request a step of the protocol makes, and who makes it.

- ``steps`` — ``QueueOps``: each write of the protocol in its order (submit's ticket,
  record moves, markers, results, heartbeats, outcomes, cancel, rerun, the fence).
- ``claims`` — ``Claimer``: one worker's claim scheduler, made of ``claim_memory``
  (``TicketMemory``: what it remembers per ticket), ``claim_listing`` (``Listing``: the
  listing), ``claim_order`` (``Picker``: which ticket next) and ``claim_examine``
  (``Examiner``: what a ticket's record says, and what needs no claim).
- ``tidy`` — a worker's background deletes of finished tickets and slots.
- ``admission`` — ``max_depth`` slots and ``rate_limit`` tokens.
- ``queue_record`` — ``QueueSettings``: the queue record, read and changed by CAS.
- ``census`` — counts and listings for ``lakeshore status`` and ``ls``.
- ``gc`` — garbage collection of finished invocations and what they left.
"""
