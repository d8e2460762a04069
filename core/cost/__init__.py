"""What LLM calls cost and the budgets that cap it (docs/cost.md).

settings.py  `[prices]` and `[budgets]` in config.toml
prices.py    a call's price: `[prices]` first, else the `genai-prices` table
meter.py     per call: reserve the worst case against every budget that applies,
             then record the real cost (`Ledger` app-wide, `RunMeter` per run)
report.py    usage summed by user, channel, job, model or day (`/usage`, `parley usage`)
"""
