"""Running bodies on a worker.

- ``bodies`` — body kinds, the names functions travel by, which bodies a worker runs.
- ``attempt`` — one attempt: heartbeats, the timeout, the outcome or the release.
- ``call`` — calling a body (in a thread of the worker) and what it gave; ``child`` — a
  body in the slot's child process.
- ``logs`` — capturing what a body prints and logs; reading it back.
"""
