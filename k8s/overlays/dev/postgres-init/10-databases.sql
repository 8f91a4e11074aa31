-- Run once by the postgres image when its data directory is first created, as
-- POSTGRES_USER, after it created POSTGRES_DB (muster_execution). One database
-- per service: they share nothing but the server.
CREATE DATABASE muster_roster;
CREATE DATABASE muster_notifier;
