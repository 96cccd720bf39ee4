"""The treadle Kubernetes operator (kopf): CRD models, handlers and status sync."""
