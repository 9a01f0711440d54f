"""Kubernetes manifests for a training job, built from the platform's published models."""
