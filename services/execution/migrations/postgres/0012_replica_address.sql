-- Where the other replicas connect to reach a replica, when its URL names a
-- Service rather than the replica itself (under TLS, the certificate names
-- the Service): the replica's own address (its pod's IP). Empty: connect
-- where the URL's host leads.
ALTER TABLE replicas ADD COLUMN address TEXT NOT NULL DEFAULT '';
