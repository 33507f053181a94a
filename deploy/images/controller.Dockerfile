# pgfleet-controller: `pgfleet serve` as an unprivileged user, its store on
# a volume at /var/lib/pgfleet (the same store after a restart resumes the
# runs). Ports: 7070 agents (gRPC), 8080 HTTP API.
#
#   docker run -v pgfleet:/var/lib/pgfleet pgfleet-controller:dev \
#       --api-token-file /run/pgfleet/api.token --join-token-file /run/pgfleet/join.token \
#       --tls-cert /run/pgfleet/cert.pem --tls-key /run/pgfleet/key.pem
FROM pgfleet-base:bookworm
COPY pgfleet /usr/local/bin/pgfleet
# A fixed uid/gid (10002), which deploy/base's Deployment runs as.
RUN groupadd --system --gid 10002 pgfleet \
 && useradd --system --uid 10002 --gid 10002 --home-dir /var/lib/pgfleet --shell /usr/sbin/nologin pgfleet \
 && mkdir -p /var/lib/pgfleet && chown pgfleet:pgfleet /var/lib/pgfleet
ENV PGFLEET_STORE=/var/lib/pgfleet/pgfleet.db \
    PGFLEET_LOG=info
USER pgfleet
VOLUME /var/lib/pgfleet
EXPOSE 7070 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/pgfleet", "serve", "--bind", "0.0.0.0:7070", "--http", "0.0.0.0:8080"]
