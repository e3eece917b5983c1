"""The one lock type the budget package uses.

After ``gevent.monkey.patch_all()``, ``threading.Lock`` is a gevent lock: it
belongs to one hub and must not be touched from native threadpool threads.
A slot may be released from such a thread (a SQLite worker, say), so we take
the original OS lock instead. It is only ever held around a few dict and int
operations that never switch greenlets, so a greenlet can never wait on it
while another greenlet of the same thread holds it, and the hub is blocked
for at most a few hundred nanoseconds when a real thread holds it.

Never run code that can yield to the hub, or that can re-enter the same lock
(``__del__`` finalizers, for instance), while holding it.
"""

from gevent import monkey

# ``_thread.allocate_lock`` is what ``threading.Lock`` was before patching.
# (``threading.allocate_lock`` no longer exists on Python 3.11+.)
allocate_lock = monkey.get_original("_thread", "allocate_lock")
