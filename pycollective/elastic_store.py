"""``python -m pycollective.elastic_store MIN MAX LAST_CALL``: the elastic launcher's rendezvous
store, in a process of its own (pycollective.rendezvous.elastic.serve says why)."""

from __future__ import annotations

if __name__ == "__main__":
    from pycollective.rendezvous.elastic import serve

    raise SystemExit(serve())
