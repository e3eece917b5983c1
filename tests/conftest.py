# Patch first: every socket, lock and thread the tests touch must be cooperative.
from gevent import monkey

monkey.patch_all()
