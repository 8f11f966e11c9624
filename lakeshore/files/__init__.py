"""The files of bodies: a data root, the run context that reads and writes it, and the
no-follow walk that keeps a ``file://`` root from being left through a link.

``dls.run`` (:mod:`lakeshore.run`) is the public face; the contract is on docs/files.md and
docs/protocol.md (the data root).

* :mod:`lakeshore.files.nofollow`: folders and files below a ``file://`` root, opened relative
  to their parent without following links.
* :mod:`lakeshore.files.root`: ``DataRoot``, and the local folders (cache, staging) that must
  be this user's own.
* :mod:`lakeshore.files.context`: ``RunContext``, the files of one body run, local call or
  producer block; the only module of lakeshore that imports fsspec.
"""

__all__: list[str] = []
