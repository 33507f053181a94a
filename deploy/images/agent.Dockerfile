# pgfleet-agent: PostgreSQL 15 server with contrib, lz4, pgbench and fio, the
# PostgreSQL versions build.sh was given (default 18, what the agent runs
# unless PGFLEET_PG_VERSION or PGFLEET_PG_BIN say otherwise), and the agent, running as the unprivileged `postgres` user (the agent starts
# PostgreSQL as itself). tini is PID 1: it forwards SIGTERM to the agent,
# which then tears its clusters down, and reaps orphans.
#
#   docker run pgfleet-agent:dev --controller https://ctl:7070 --ca /run/pgfleet/ca.pem \
#       --class gp3 --token-file /run/pgfleet/join.token
#
# Storage caps and instance emulation need root and cgroups: in this
# non-root image they are off (--no-emulate); give the agent real storage
# of the class under test as its data root (a volume at /data).
FROM pgfleet-base:bookworm
ARG PG_INSTALLS=/opt/pgfleet/postgres
COPY postgres/ ${PG_INSTALLS}/
COPY pgfleet-agent /usr/local/bin/pgfleet-agent
# A fixed uid/gid (10001), which Kubernetes pods run as and give their
# volume to (controller/server/src/agents/kubernetes.rs: AGENT_UID).
RUN old_uid=$(id -u postgres) old_gid=$(id -g postgres) \
 && groupmod -g 10001 postgres && usermod -u 10001 -g 10001 postgres \
 && find / -xdev -uid "$old_uid" -exec chown -h postgres {} + \
 && find / -xdev -gid "$old_gid" -exec chgrp -h postgres {} + \
 && mkdir -p /data && chown postgres:postgres /data && chmod 0700 /data
ENV PGFLEET_DATA_ROOT=/data \
    PGFLEET_PG_INSTALLS=${PG_INSTALLS} \
    PGFLEET_PG_USER=postgres \
    PGFLEET_LOG=info
USER postgres
VOLUME /data
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/pgfleet-agent", "run", "--no-emulate"]
