# syntax=docker/dockerfile:1
# chime's image: one static binary on distroless static, as a non-root user.
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/chime-nats/chime:0.1.0 .
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first: they stay cached while only the source changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.0.0-dev
# Static (no cgo), without local paths, the version in main.version.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/chime ./cmd/chime

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/chime /chime
# The nonroot user of distroless (65532), as the chart's securityContext.
USER 65532:65532
# HTTP (API, callbacks, /metrics, /healthz, /readyz); 4222 only when the
# server is embedded and CHIME_NATS_LISTEN opens it.
EXPOSE 8080
ENTRYPOINT ["/chime"]
CMD ["serve"]
