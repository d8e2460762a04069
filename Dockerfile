# Parley in a container: slim Python, a non-root user, `parley run` as the entrypoint.
#   docker build -t parley .
#   docker run --rm -it -e OPENAI_API_KEY parley            # or -e ANTHROPIC_API_KEY
#   docker run --rm -it -v $PWD/config.toml:/app/config.toml -v parley-data:/home/parley/.parley \
#     -e OPENAI_API_KEY -e SLACK_BOT_TOKEN -e SLACK_APP_TOKEN parley
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PARLEY_CONFIG=/app/config.toml

# bash and git are what the built-in `bash` tool and the example tools.yaml use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bash git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 parley

WORKDIR /app
COPY pyproject.toml README.md ./
COPY core ./core
COPY channels ./channels
COPY bot ./bot
RUN pip install '.[postgres,mcp,otel]'  # the shared store (workers scale out), MCP servers, traces
COPY config.toml tools.yaml ./

USER parley
# The store (conversations, runs, jobs), events log, workspace and artifacts live in the
# user's home: mount a volume at /home/parley/.parley to keep them across restarts.
# `docker stop` sends SIGTERM: running turns reach a checkpoint before Parley exits.
STOPSIGNAL SIGTERM
VOLUME ["/home/parley/.parley"]
# The operator's endpoint when [server] listen = "0.0.0.0:9464": probes, /metrics, the page.
EXPOSE 9464
ENTRYPOINT ["parley", "run"]
