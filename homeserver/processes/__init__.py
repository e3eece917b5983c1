"""The processes: main's serve loop, the federation worker shards and their supervision,
and the IPC frames between them. The one place that starts, stops and drains servers."""
