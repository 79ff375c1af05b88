"""The method contract's old import path, kept for packages written against it: everything is in
:mod:`reflexdb.trainer.method_api` (renamed in issue 52, so that no two folders are called
``methods``: ``methods/`` holds the methods, ``trainer/method_api/`` the contract they implement)."""

from .method_api import *  # noqa: F401,F403
from .method_api import __all__  # noqa: F401
