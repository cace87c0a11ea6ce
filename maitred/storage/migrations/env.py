"""Alembic environment: migrations run on the engine handed over by ``maitred.storage.migrate``."""

from alembic import context

from maitred.storage.models import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
