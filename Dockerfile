# One Dockerfile for every service: pick the crate with --build-arg SERVICE=<name>.
ARG SERVICE=tickets

FROM rust:1.95-bookworm AS builder
ARG SERVICE
WORKDIR /src
COPY . .
# No --features: fail points (`failpoints`) are for crash tests only and must
# never ship. --locked builds exactly the versions in Cargo.lock.
RUN cargo build --release --locked -p ${SERVICE}

# Same Debian release as the builder, so the binary's glibc matches.
FROM debian:bookworm-slim
ARG SERVICE
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# Run as an unprivileged user; its home is the working directory, so the
# SQLite fallback (./.sandbox) is writable when no DATABASE_URL is given.
RUN useradd --system --uid 10001 --create-home --home-dir /app app
WORKDIR /app
COPY --from=builder /src/target/release/${SERVICE} /usr/local/bin/service
USER 10001
# The tickets defaults; another service overrides its own <SERVICE>_ADDR and port.
# 0.0.0.0 because the service's default, 127.0.0.1, is unreachable from outside.
ENV TICKETS_ADDR=0.0.0.0:7001
EXPOSE 7001
ENTRYPOINT ["/usr/local/bin/service"]
