"""SendGrid v3 Mail Send (email): ``providers.sendgrid.backend.SendGridEmailBackend``."""
