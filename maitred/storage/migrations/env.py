"""Alembic environment: migrations run on the engine handed over by ``maitred.storage.migrate``,
in one locked transaction (see that module)."""

from alembic import context

from maitred.storage.migrate import run_in_env
from maitred.storage.models import Base

run_in_env(context, Base.metadata)
