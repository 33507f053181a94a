# pgfleet-prometheus: Prometheus from Debian's package (build.sh copies its
# binary into the context), on the same base, for deploy/compose. Mount a
# configuration at /etc/prometheus/prometheus.yml.
FROM pgfleet-base:bookworm
COPY prometheus /usr/bin/prometheus
RUN mkdir -p /prometheus /etc/prometheus && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
VOLUME /prometheus
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus", "--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", "--web.listen-address=0.0.0.0:9090"]
