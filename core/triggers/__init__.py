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

Not yet: the configuration, the HTTP route, the store's deliveries and dedupe, the runs,
correlation by `thread_by`, the CLI and the metrics.
"""
