"""A step's allocator mutations as one transaction: journaled as they happen, undone newest first.

A mixin of ``BlockManager`` (``allocators/block_manager.py``): between ``begin`` and ``commit`` each
mutation appends what undoes it (a block appended, a table grown, a block named, a copy-on-write, a sequence's whole
tables before a move or a free); ``rollback`` replays the journal backwards, so that a step a policy
broke halfway leaves ref counts, tables and names exactly as they were.
"""

from __future__ import annotations


class Transactions:
    """``begin``, ``commit`` and ``rollback`` over a block manager's pools, tables and names."""

    def begin(self) -> None:
        self._journal = []

    def commit(self) -> None:
        self._journal = None

    def rollback(self) -> None:
        """Undo every mutation since ``begin``, newest first; ref counts and tables come back exactly."""
        journal, self._journal = self._journal or [], None
        for entry in reversed(journal):
            kind, sid = entry[0], entry[1]
            if kind == "append":
                self.gpu.release(self.gpu_tables[sid].pop())
            elif kind == "grew":  # the blocks a prefill chunk added, newest first (unnamed again by now)
                table = self.gpu_tables[sid]
                self.gpu.release_many(table[entry[2] :][::-1])
                del table[entry[2] :]
            elif kind == "named":
                self.gpu.forget(entry[3])
                self._registered[sid] = entry[2]
            elif kind == "cow":
                table = self.gpu_tables[sid]
                self.gpu.take(entry[2])
                self.gpu.release(table[-1])
                table[-1] = entry[2]
            else:  # "tables": restore the exact tables a sequence had
                _, sid, gpu_table, cpu_table, registered = entry
                if sid in self.gpu_tables or sid in self.cpu_tables:
                    self._release(sid)
                for table, pool, tables in (
                    (gpu_table, self.gpu, self.gpu_tables),
                    (cpu_table, self.cpu, self.cpu_tables),
                ):
                    if table is not None:
                        for b in table:
                            pool.take(b)
                        tables[sid] = list(table)
                self._registered[sid] = registered

    def _log_tables(self, seqs) -> None:
        if self._journal is None:
            return
        for seq in seqs:
            sid = seq.seq_id
            gpu_table, cpu_table = self.gpu_tables.get(sid), self.cpu_tables.get(sid)
            self._journal.append(
                (
                    "tables",
                    sid,
                    tuple(gpu_table) if gpu_table is not None else None,
                    tuple(cpu_table) if cpu_table is not None else None,
                    self._registered.get(sid, 0),
                )
            )
