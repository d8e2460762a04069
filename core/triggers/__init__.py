"""triggers: the team's systems start runs (docs/triggers.md).

A signed webhook from GitHub, GitLab, Sentry, PagerDuty, a Standard Webhooks sender or
anything holding a bearer token starts a run that posts into a channel. Built so far:

- `verify`: each source's signature scheme as a pure function, with the delivery id
  and event type the source gives.
- `body`: the body-size rule (413 from `Content-Length` before reading, and a read that
  stops once it passes the limit).
- `expr`: the `filter`/`close_on` expression language (a whitelist of `ast` nodes walked
  over the JSON body; no eval), checked at load.
- `template`: `prompt`/`message`/`thread_by` templates (missing fields render empty, with
  a warning) and the fenced, capped block that carries untrusted payload data.
- `config`: the `[triggers.NAME]` model, checked at load, and the secret variables' check.

Not yet: the HTTP route, the runs, correlation by `thread_by` and the metrics (the
store's deliveries are `core.store.trigger_tables`; `parley triggers` is `bot.triggers_cli`).
"""
