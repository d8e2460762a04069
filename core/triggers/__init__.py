"""triggers: the team's systems start runs (docs/triggers.md).

A signed webhook from GitHub, GitLab, Sentry, PagerDuty, a Standard Webhooks sender or
anything holding a bearer token starts a run that posts into a channel:

- `verify`: each source's signature scheme as a pure function, with the delivery id
  and event type the source gives.
- `body`: the body-size rule (413 from `Content-Length` before reading, and a read that
  stops once it passes the limit).
- `expr`: the `filter`/`close_on` expression language (a whitelist of `ast` nodes walked
  over the JSON body; no eval), checked at load.
- `template`: `prompt`/`message`/`thread_by` templates (missing fields render empty, with
  a warning) and the fenced, capped block that carries untrusted payload data.
- `config`: the `[triggers.NAME]` model, checked at load, and the secret variables' check.
- `kinds`: the kinds of run a delivery queues (`trigger`, `post`) and the channel part of
  a trigger conversation's key.
- `receive`: one delivery taken in — verified, rate-counted, decided, and accepted with its
  runs in one store transaction before the 2xx.

The HTTP route is `bot.hooks`; the platform threads `bot.trigger_threads`; the store's
deliveries, threads and rate `core.store.trigger_tables`; `parley triggers`
`bot.triggers_cli`.
"""
