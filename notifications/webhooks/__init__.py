"""Status webhooks to the calling services (docs/WEBHOOKS.md): endpoints per API client, events
written to an outbox by the lifecycle in the status move's transaction, delivered signed (Standard
Webhooks) by their own worker."""
